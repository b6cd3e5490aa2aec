"""The harness that serves one agent or function inside every revision (see `caiplatform.harness.app`)."""
