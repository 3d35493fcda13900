"""envport.witnesses"""
