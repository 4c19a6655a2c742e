"""Third-party model corpus: adapters around model code released on PyPI (penzai, gemma, optax).

The adapter modules import each other by plain name (`from penzai_model import ...`), as
equivci loads an entrypoint file with its own folder on sys.path; code outside this folder puts
corpus/ on sys.path first (see corpus/numeric_check.py).
"""
