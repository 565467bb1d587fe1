"""Mechanisms: how shadow-model gradients are turned into updates (docs/theory.md §1), one module per family.

A mechanism names the tensors it trains (its ``parameterization``, see :mod:`dpaudit.models`), draws its
per-model randomness in :meth:`Mechanism.setup`, and maps each step's gradients to the update the optimiser
applies in :meth:`Mechanism.transform` (or owns the update through the hooks of the base class
:class:`dpaudit.mechanisms.base.Mechanism`, no-ops by default), and states its guarantee as a privacy event
(:meth:`Mechanism.privacy`, :mod:`dpaudit.mechanisms.privacy`) that :mod:`dpaudit.bounds` turns into a bound. The
engine knows nothing about privacy.

Modules: ``nonprivate`` (none, lora-fa), ``wishart`` (noise-free projection, M1, M2), ``sketch`` (noisy
LoRA-FA), ``dpsgd`` (DP-SGD, DP-LoRA, DP-LoRA-FA; the shared clipping and noise), ``prism`` (its maths in
``prism_tangent``, ``prism_update``, ``prism_noise_energy``), ``denoise``;
``registry`` is the one table of mechanism names (``--mechanism``) and the options that apply to each (docs/theory.md
§1).

The package itself imports nothing: :mod:`dpaudit.mechanisms.releases` (mechanism-level audits, numpy only)
must load without torch, and so must ``registry``, ``privacy`` and ``base``, which :mod:`dpaudit.config` loads.
"""
