"""Layers: split both programs into the user's named scopes and hash each layer canonically."""
