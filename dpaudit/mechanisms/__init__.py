"""Mechanisms: how shadow-model gradients are turned into updates (docs/theory.md §1), one module per family.

A mechanism names the tensors it trains (its ``parameterization``, see :mod:`dpaudit.models`), draws its
per-model randomness in :meth:`Mechanism.setup`, and maps each step's gradients to the update the optimiser
applies in :meth:`Mechanism.transform` (or owns the update through the hooks of the base class
:class:`dpaudit.mechanisms.base.Mechanism`, no-ops by default), and states its guarantee as a privacy event
(:meth:`Mechanism.privacy`, :mod:`dpaudit.mechanisms.privacy`) that :mod:`.bounds` turns into a bound. The
engine knows nothing about privacy.

Modules: ``catalogue`` (every mechanism name, the options that apply to it and the planted bugs; torch-free, read
by :mod:`dpaudit.config`), ``privacy`` (the privacy events), ``base`` (the :class:`Mechanism` a user subclasses),
``nonprivate`` (none, lora-fa), ``wishart`` (noise-free projection, M1, M2), ``sketch`` (noisy LoRA-FA), ``dpsgd``
(DP-SGD, DP-LoRA, DP-LoRA-FA; the shared clipping and noise), ``mutants`` (DP-SGD with a planted bug), ``prism``
(its maths in ``prism.tangent`` and ``prism.update``), ``denoise``. Names become objects in one place above the
config, :mod:`dpaudit.campaign.resolve`.

The package itself imports nothing, and ``catalogue``, ``privacy`` and ``base`` load without torch.
"""
