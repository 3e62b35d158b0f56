"""pytest plugin (contract tests); being built."""
