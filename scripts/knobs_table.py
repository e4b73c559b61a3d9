"""Print the "Knobs" table of docs/usage.md: each knob of memledger.article.knobs.RUNGS and the bytes it saves at the peak.

    PYTHONPATH=. python scripts/knobs_table.py        # Markdown, for docs/usage.md
"""
from memledger.article.knobs import knob_table

if __name__ == "__main__":
    print(knob_table().markdown())
