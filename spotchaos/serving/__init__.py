"""Services under test: their declaration, the load, the notice channels and the drain verdict."""
