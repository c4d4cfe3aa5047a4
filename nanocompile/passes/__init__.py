"""Graph passes, one module each with one entry point: cse, fold_constants, plan_fusion."""
