"""The shipped patch set: one YAML (the declaration) beside one small module (the implementation)."""
