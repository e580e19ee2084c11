"""Adapters: the only modules that import a driver. Each implements ports for one technology."""
