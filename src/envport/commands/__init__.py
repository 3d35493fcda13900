"""envport.commands"""
