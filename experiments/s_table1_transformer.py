"""[S] Table 1 analogue on the byte-level transformer: MIA on full fine-tuning vs LoRA vs LoRA-FA of text.

Part 1 of ``s_table1_lora_variants.py`` (:func:`s_table1_lora_variants.part1`, the same variants, attacks and
design) on ``--dataset text``: the byte-level causal transformer of :mod:`dpaudit.models.transformer` (2 pre-LayerNorm
blocks, d_model 64, LoRA on q/k/v/out/fc1/fc2), pretrained on the public split of the embedded corpus
(:mod:`dpaudit.data.text`: Python's ``pydoc_data.topics``, 64-byte windows), fine-tuned on its private split. Every
private window is a target, IN for half of ``--models`` models (all-examples design); each model scores a window
by its log-likelihood, the score of [S] Eq. 16's reference attack (θ_ref = the pretrained base) and of LiRA online.
Non-private fine-tuning through the DP-SGD family with σ = 0 and C = ∞: full fine-tuning (``dp-sgd``: the
weight of every Linear layer, the output head's included; embeddings, biases and LayerNorms stay frozen), both
LoRA factors (``dp-lora``) and B only (``dp-lora-fa``), at ranks (4, 16, 64) and batch sizes 32 and 128. [S]
Table 1's claim (GPT-2 on Enron / Pubmed / PTB): LoRA lowers the MIA AUC vs full fine-tuning, LoRA-FA lowers it
further, smaller r and larger b lower it.

CPU scale: 32 models per point, 3 epochs (18 minutes on 2 shared cores); ``--paper-scale``: 256 models, the
paper's E = 20 epochs and ranks (8, 64, 256) clipped to d_model = 64 (hours).

    python experiments/s_table1_transformer.py
"""

from __future__ import annotations

import _common
import s_table1_lora_variants
import torch

from dpaudit import models
from dpaudit.campaign import resolve as resolver
from dpaudit.models import transformer

NAME = "s_table1_transformer"


def description(dataset: str) -> dict:
    """Columns describing the setting: the corpus bytes cut into windows, the window length and the model's size."""
    loaded = resolver.load_dataset(dataset)
    model = models.for_input(loaded.input_shape, loaded.num_classes, loaded.task)
    assert isinstance(model, transformer.CausalTransformer)
    windows = sum(len(split) for split in (loaded.public, loaded.private, loaded.test))
    length = loaded.input_shape[0]
    return dict(
        dataset=dataset,
        corpus_bytes=windows * (length + 1),
        sequence_length=length,
        private_sequences=len(loaded.private),
        layers=len(model.blocks),
        d_model=model.token.embedding_dim,
        parameters=sum(p.numel() for p in model.parameters()),
    )


def main(argv: list[str] | None = None) -> None:
    parsed = _common.parser(__doc__, dataset="text")
    parsed.add_argument(
        "--ranks",
        type=int,
        nargs="+",
        help="LoRA-FA ranks at the smaller batch size; default: 4 16 64 (paper scale: 8 64 256)",
    )
    parsed.add_argument(
        "--batch-sizes",
        type=int,
        nargs=2,
        default=(32, 128),
        metavar=("B", "LARGE"),
        help="the rows' batch size and the larger-batch LoRA-FA row's (default: 32 128)",
    )
    s_table1_lora_variants.add_optimizer_argument(parsed)
    args = parsed.parse_args(argv)
    if args.dataset.split(":", 1)[0] != "text":
        parsed.error(f"--dataset {args.dataset}: this script audits the text transformer (text or text:PATH)")
    models_count, epochs = _common.scale(args, cpu=(32, 3), paper=(256, 20))
    # Each campaign pretrains the transformer in this process (the workers train with one thread each): one thread
    # here too, so the base is the same on any machine, and a loaded 2-core machine does not slow it several-fold.
    torch.set_num_threads(1)
    ranks = args.ranks or ((8, 64, 256) if args.paper_scale else (4, 16, 64))
    title = "byte-level transformer, text"
    columns = description(args.dataset)
    s_table1_lora_variants.part1(args, NAME, ranks, models_count, epochs, title, columns, tuple(args.batch_sizes))


if __name__ == "__main__":
    main()
