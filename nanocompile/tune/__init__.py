"""Autotuning on the machine it runs on: each distinct kernel's schedule space searched with
measurements (issue 14).

  space     the candidates: schedule/recipes.py's knob grid per kernel class, nearest the recipe first
  harness   one kernel's candidates compiled side by side, checked bit for bit, timed
  search    alternated pairs against the incumbent and a sign test; replays from recorded samples
  store     the results as JSON in the cache, keyed by CPU model, ISA level and kernel
  tuner     the whole model: two searches within a budget, unstable winners, the table compile uses
"""
