"""The draft's weights: how much each piece of evidence says that two files, or two adjacent
pieces of the messy timeline, belong to one commit (log-odds). Fitted by logistic regression
on the real histories of bench/plan_ranges.toml, by `python3 bench/plan_fit.py`, which prints
this module; see docs/plan.md."""

from __future__ import annotations

# a pair of files: log-odds = intercept + the sum of weight * feature (plan/evidence.py)
PAIR = {
    'intercept': -1.548,
    'same folder': 0.115,
    'same top folder': 0.425,
    'same role': 0.535,
    'both ci': -0.100,
    'both docs': 0.392,
    'both changelog': 0.410,
    'both deps': 0.000,
    'both config': -0.087,
    'both test': -0.059,
    'both code': -0.022,
    'code and test': -0.012,
    'code and docs': 0.221,
    'code and changelog': -0.032,
    'same name': 0.239,
    'import': -0.023,
    'shared identifiers': 0.844,
    'shared lines': 0.262,
    'both added': 0.567,
    'both deleted': 0.582,
    'added and not': -0.211,
}
# a unit of the timeline and the next: does the next continue the same piece of work?
GOES_ON = {
    'intercept': 0.436,
    'mean score': 1.142,
    'best score': 0.050,
    'window score': 0.395,
    'next says nothing': 0.649,
    'this says nothing': 0.491,
    'gap': -0.699,
    'this size': -0.054,
    'next size': -0.315,
    'granularity': 0.441,
}
# average linkage merges two groups while their pairs' mean log-odds is above this
LINK = 2.0
