"""Training-free audits of a mechanism's release (``dpaudit audit-mechanism``).

``releases`` samples the release of a neighbouring pair (numpy
only), ``audit`` scores it, bounds ε from below and compares it with the accountants.
"""
