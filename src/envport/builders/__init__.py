"""envport.builders"""
