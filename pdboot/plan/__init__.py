"""The plan (pure): model (Service, HostPlan, Plan: the whole truth), build (inventory -> plan),
render (compose YAML text, config hash), converge (observed containers vs the plan -> steps)."""
