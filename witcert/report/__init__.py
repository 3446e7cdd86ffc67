"""``witcert report``: the benchmark report (quad table, soundness, needles, budget, quality).

Modules, one per concern: ``engine`` (offline compressed decoding on a real model),
``texts`` (the two text domains), ``quad``, ``soundness``, ``needles``, ``budget``,
``quality`` (the sections), ``stats`` (paired bootstrap, McNemar), ``cache`` (resumable
results), ``plots``, ``build`` (runs everything) and ``markdown`` (writes report.md).
Nothing heavy is imported here.
"""
