"""A LangGraph ReAct agent: the model decides when to call `get_weather`."""

from langgraph.prebuilt import create_react_agent
from tools import get_weather

from caiplatform.turns.models import chat_model

graph = create_react_agent(chat_model(), [get_weather])
