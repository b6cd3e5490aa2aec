"""A Google ADK agent with one tool."""

from google.adk.agents import LlmAgent

from caiplatform.turns.models import adk_model


def get_weather(city: str) -> str:
    """Weather of a city."""
    return f"sunny in {city}"


root_agent = LlmAgent(
    name="weather_agent",
    model=adk_model(),
    instruction="Answer questions about the weather; use get_weather.",
    tools=[get_weather],
)
