"""Study code behind the experiments, not part of an audit.

The planted-bug audits (``mutant_audit``), PRISM's noise energy (``prism_noise_energy``) and [D]'s cosine
improvement (``denoise_cosine``). Nothing in the library imports these modules.
"""
