"""management"""
