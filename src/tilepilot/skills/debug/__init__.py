"""skills/debug"""
