"""The CLI's contract for bad input, as the tests check it: one line on stderr, no traceback."""

from __future__ import annotations


def one_line_error(capsys, *fragments: str) -> str:
    """The captured stderr, asserted to be one line without a traceback that holds every one of ``fragments``."""
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err
