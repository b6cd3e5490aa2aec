def get_weather(city: str) -> str:
    """Weather of a city."""
    return f"sunny in {city}"
