"""What a person reads: a run's files and the audit report.

``summary`` (a run's numbers and finding), ``figures`` (ROC and friends as PNG), ``run_report``
(a run directory's summary.json, scores.csv and plots) and ``audit_report`` (report.html and report.md of one or
several runs).
"""
