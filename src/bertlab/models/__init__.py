"""The model families, one folder each: `bert/` (BERT: config, modeling, task heads, TF checkpoint conversion)
and `t5/` (T5: config, modeling, generation, its tokenizer binding, corruption transforms and objectives). A
family knows nothing of another; what they share lives below them (`nn/`, `checkpoint/`, `jsonconfig.py`,
`tokenizer/`), and the recipes, tasks, inference and serving above them work for every family.
"""
