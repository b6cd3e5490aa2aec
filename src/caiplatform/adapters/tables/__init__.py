"""Adapters over the platform's own database tables."""
