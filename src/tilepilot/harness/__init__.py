"""Harnesses that run a plan on the production runner and compare it with the FP32 oracle.

They sit above the runtime (they build runners) and below the skills (phases 1-7, the optimizations, the debug
skills and the evaluator all re-run them): ``model_gate`` for the whole model, ``probes`` for one kernel
instance or one dispatch group, ``prompts`` for the gate's real-text prompts.
"""
