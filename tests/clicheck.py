"""Shared helpers of the command-line tests: run ``memledger`` in-process, and check a one-line refusal."""
from memledger.cli.main import main

__all__ = ["refused", "run"]


def run(capsys, *args):
    """(exit status, stdout, stderr) of ``memledger *args`` (each argument passed as its ``str``)."""
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def refused(capsys, *args, message=""):
    """Exit 2, nothing on stdout, one line on stderr containing ``message`` and no traceback; returns it."""
    code, out, err = run(capsys, *args)
    assert (code, out) == (2, ""), (code, out[:200], err)
    assert err.count("\n") == 1 and err.startswith("memledger: error: ") and "Traceback" not in err, err
    assert message in err, err
    return err
