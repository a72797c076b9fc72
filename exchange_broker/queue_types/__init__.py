"""queue_types"""
