"""Plans that ship with Tiffany (the demo plan)."""
