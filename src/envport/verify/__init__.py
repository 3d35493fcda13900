"""envport.verify"""
