"""Views for Jupyter and the book: a ledger's verdict as an HTML bar, the saved-tensor inventory and a
recipe's components as tables (:class:`memledger.core.table.Table`)."""
from html import escape

from ..core.table import Table, plain
from ..core.units import format_bytes, unit_size

_GROUP_COLOURS = {"model_states": "#4C72B0", "activations": "#DD8452", "overhead": "#8C8C8C"}


def html_verdict(ledger, gpu_bytes: int, unit: str = "GB", peak: bool = False) -> str:
    """A stacked bar of the GPU rows against ``gpu_bytes``, and the verdict sentence
    (:func:`memledger.answers.verdict.sentence`: fits, no fit under the margin, does not fit; pure HTML) that says
    what it judged (:mod:`memledger.answers.verdict`): with ``peak``, the step's peak where the timeline models the
    setup (marked on the bar), else the sum of the rows at the end of the forward pass, as the static
    calculator, which cannot run the timeline, judges. The block carries the judged bytes and the measure's key
    (``data-bytes``, ``data-measure``), as ``memledger ledger --json`` prints them (``judged_bytes``, ``measure``)."""
    from ..answers.verdict import SUM_CLAUSE, assess, describe, judge, sentence, standing, uses_peak
    used = ledger.totals["gpu"]
    judged = judge(ledger, uses_peak(ledger) if peak else False)
    scale = max(used, gpu_bytes, judged.bytes)
    segments = "".join(
        f'<div title="{escape(r.name)}: {format_bytes(r.bytes, unit)}" style="width:{100 * r.bytes / scale:.3f}%;'
        f'background:{_GROUP_COLOURS[r.group]};border-right:1px solid white"></div>'
        for r in ledger.rows if r.device == "gpu" and r.bytes)
    line = f'<div style="position:absolute;left:{100 * gpu_bytes / scale:.3f}%;top:-4px;bottom:-4px;' \
           f'border-left:3px dashed crimson"></div>'
    marks = "dashed line: GPU memory"
    if judged.key != "total":
        line += (f'<div title="{escape(judged.measure)}: {format_bytes(judged.bytes, unit)}" style="position:absolute;'
                 f'left:{100 * judged.bytes / scale:.3f}%;top:-4px;bottom:-4px;border-left:3px solid black"></div>')
        marks += f"; solid line: {escape(judged.measure)}"
    clause = describe(ledger, judged, unit) if peak else SUM_CLAUSE
    assessment = assess(judged.bytes, gpu_bytes, unit)
    rest = sentence(judged.bytes, gpu_bytes, clause, unit)[len(assessment):]        # "; X per GPU against Y, ..."
    colour = "green" if standing(judged.bytes, gpu_bytes) == "fits" else "crimson"
    verdict = f'<b style="color:{colour}">{escape(assessment)}</b>{escape(rest)}'
    legend = " ".join(f'<span style="color:{c}">&#9632;</span> {g.replace("_", " ")}' for g, c in _GROUP_COLOURS.items())
    return (f'<div class="memledger-verdict" data-measure="{judged.key}" data-bytes="{judged.bytes}"><p>{verdict}</p>'
            f'<div style="position:relative;display:flex;height:22px;background:#eee;margin:6px 0">{segments}{line}</div>'
            f'<p style="font-size:85%">{legend}; {marks}</p></div>')


def inventory_table(rows, values=None, unit: str = "MiB") -> Table:
    """Saved tensors: name, why autograd keeps it, shape, dtype, bytes (symbolic, and at ``values``:
    symbol name -> number, e.g. ``Ledger(...).values``)."""
    from ..core.exact import evaluate_expr
    sizes = [evaluate_expr(r.bytes, values) for r in rows] if values else None
    header = ("tensor", "block", "kept because", "shape", "dtype", "bytes") + ((unit,) if values else ())
    return Table(header, [
        (r.name, r.block, r.why, " × ".join(str(s) for s in r.shape), r.dtype, plain(r.bytes))
        + ((format_bytes(sizes[i], unit, 0 if sizes[i] % unit_size(unit) == 0 else 2),) if values else ())
        for i, r in enumerate(rows)])


def recipe_table(recipe, n_params: int = None, unit: str = "GB") -> Table:
    """Components of a recipe: dtype, bytes/param, ZeRO role (and bytes for ``n_params``)."""
    header = ("component", "dtype", "bytes/param", "ZeRO shards it as", "why it exists") + (
        (f"for {n_params:,} params",) if n_params else ())
    return Table(header, [
        (c.name, c.dtype, c.bytes_per_param, c.role, c.why)
        + ((format_bytes(c.bytes_per_param * n_params, unit, 0),) if n_params else ())
        for c in recipe.components])


__all__ = ["html_verdict", "inventory_table", "recipe_table"]
