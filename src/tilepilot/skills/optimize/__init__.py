"""skills/optimize"""
