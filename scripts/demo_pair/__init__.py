"""The code pair's build recipes (scripts/build_demo_pair.py): its corpus, its tokenizer and its target's
training. They make assets/demo once; the app never runs them, so they live outside engine/."""
