"""durability"""
