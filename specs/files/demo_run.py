#!/usr/bin/env python3
"""demo-cpu's shim: proves a shim file reached the env with its bytes."""
import os

print("demo ok:", os.environ.get("DEMO_GREETING", "<unset>"))
