"""Training recipes for the embedded demo pair (corpus, tokenizer, target model, drafter).

These modules run offline on a CPU and are used by ``scripts/build_demo_pair.py``; nothing in the
app imports them at run time.
"""
