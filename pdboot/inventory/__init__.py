"""The inventory: schema (pydantic models), load (YAML caps, file:line errors), rules (cross-field),
engines and dp (the engines of each tier per host, their GPUs, ports and DP ranks), safety."""
