"""Training K shadow models at once: how they see the data, their per-example gradients, the engine, canaries.

``sampling`` (batch layouts, Poisson and shuffled batches, SGD settings; torch-free) → ``gradients`` (per-example
gradients, materialised or factored) → ``passes`` (a step's passes on the CPU's threads at once) → ``engine``
(the batched training loop, which takes a mechanism and an optional step observer) ← ``canaries`` (gradient
canaries inserted into the steps and observed).
"""
