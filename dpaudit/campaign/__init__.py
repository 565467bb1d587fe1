"""A membership-inference campaign, from names to outputs on disk.

``resolve`` (names → dataset, base model, mechanism) → ``plan`` (the setup saved before training: base, targets,
membership, claimed privacy event) → ``shadow`` (a chunk of shadow models trained, its outputs) → ``runner``
(chunks on worker processes, resume) → ``store`` (the run directory, the only state). ``sketch_inputs`` measures
[S] Lemma 7.2's inputs on a LoRA-FA campaign.
"""
