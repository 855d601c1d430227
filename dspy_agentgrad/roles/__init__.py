"""The optimizer's own LM roles (gradient, aggregation, rewrite), their prompts, and the instruction-proposer hook."""
