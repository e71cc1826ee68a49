"""An ordinary LangChain agent; the only spanrl line is the reward. Run it under opentelemetry-instrument."""

from langchain_core.messages import HumanMessage, SystemMessage
from langchain_openai import ChatOpenAI

import spanrl

llm = ChatOpenAI(model="tiny-calc", temperature=0.0)  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
answer = llm.invoke([SystemMessage("You are a calculator. Answer with the number only."),
                     HumanMessage("What is 2 + 3?")])
print("answer:", answer.content)

spanrl.emit_reward(1.0 if answer.content.strip() == "5" else 0.0)
