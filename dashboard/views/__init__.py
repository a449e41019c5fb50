"""The dashboard's views, one module per area; ``common`` holds what they share."""
