"""skills/phases"""
