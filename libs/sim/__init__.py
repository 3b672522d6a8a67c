"""The simulator: replay a workload (SWF trace or GPU-job CSV) through the pure core in virtual time.

``workload`` parses traces into ``SimJob`` records, ``engine.simulate`` drives ``state.apply`` and
``plan.plan`` with a virtual clock, ``report`` computes the metrics and writes the per-job CSV.
"""
