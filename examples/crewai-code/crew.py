"""A CrewAI crew whose analyst runs the Python its model writes in the platform's code sandbox.

`crewai_code_tool()` is the `run_code` tool: each call runs one snippet in a fresh sandbox (no network, no view
of this agent's files or environment, 1 CPU, 512 MiB) and answers stdout, stderr, the exit code and, when the
snippet was stopped, why (docs/codesandbox.md). crewai lives in the agent's own environment
(requirements.txt), as for any crew.
"""

from crewai import Agent, Crew, Task

from caiplatform.turns.code_tool import crewai_code_tool
from caiplatform.turns.models import crewai_llm


def crew():
    analyst = Agent(
        role="analyst",
        goal="answer questions that need computing, from the output of code you run",
        backstory="You write short Python programs and run them with run_code instead of guessing.",
        llm=crewai_llm(),
        tools=[crewai_code_tool()],
    )
    task = Task(description="{message}\nConversation so far:\n{history}", expected_output="the answer",
                agent=analyst)
    return Crew(agents=[analyst], tasks=[task])
