"""envport.launchers"""
