"""The policy side of one collector: what the user passed, resolved once (`resolve`), run per
step on the carrier's views (`steps`), its weights and how updates are checked (`weights`), its
device and version (`holder.PolicyHolder`, the entry point), one policy per team of agents
(`policy_map`), recurrent state carried between steps, and the env transforms it implies."""
