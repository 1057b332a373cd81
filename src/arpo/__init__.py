"""arpo: Agentic Reinforced Policy Optimization (arXiv 2507.19849) for multi-turn tool-using LLM agents.

Data flows one way: dataset -> rollout tree -> rewards -> advantages -> loss -> update.
See ../docs and the package layout: engine/ (batched KV-cached generation), rollout/ (agent loop,
trees, branching), tools/, rewards/, algos/ (pure tensor math), data/, recipes/, eval/.
"""

__version__ = "0.1.0"
