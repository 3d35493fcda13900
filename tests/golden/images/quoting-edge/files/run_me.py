#!/usr/bin/env python3
print("run me")
