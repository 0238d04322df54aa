"""Training a DFlash drafter for a target (`dflash-desktop train-draft`): self-distillation on the target's
own answers (draft_trainer.py) and checkpoints that hold tensors and JSON only (checkpoint.py). The code
pair's own recipes (corpus, tokenizer, target) live in scripts/demo_pair/."""
