"""The seeds' import paths over flextrain's native API, so their scripts run with only imports changed.

``from flextrain.compat import aikit`` stands for AIkit's ``import aikit.elastic.Torch`` /
``import aikit.ga.Torch`` (and the TF side); see docs/elastic-scripts.md for the table of
seed names and the flextrain names behind them. ``from flextrain.compat.atorch import
auto_accelerate`` stands for ATorch's (docs/accelerate.md).
"""
