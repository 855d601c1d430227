"""The main job: AgentGrad optimizing a real program on the embedded LM, offline."""
