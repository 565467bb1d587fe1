"""The sections of ``experiments/RESULTS.md``, one module per paper, rendered by ``experiments/make_results.py``.

* :mod:`.sources`: the CSVs a section reads, and :class:`~.sources.Section`, what it returns;
* :mod:`.statistics`: the tests behind the verdicts; :mod:`.formatting`: numbers, intervals, tables, wrapping;
* :mod:`.wishart` ([W]), :mod:`.sketch` ([S]), :mod:`.prism` ([P]), :mod:`.denoise` ([D]): each paper's sections;
* :mod:`.audits`: the mechanisms' own audits (bounds against audits, tightness, planted bugs) and the timing.
"""
