"""An ordinary OpenAI-client agent; the only spanrl line is the reward. Run it under opentelemetry-instrument."""

import openai

import spanrl

client = openai.OpenAI()  # OPENAI_BASE_URL and OPENAI_API_KEY from the environment
messages = [
    {"role": "system", "content": "You are a calculator. Answer with the number only."},
    {"role": "user", "content": "What is 2 + 3?"},
]
reply = client.chat.completions.create(model="tiny-calc", messages=messages, temperature=0.0)
answer = reply.choices[0].message.content
print("answer:", answer)

spanrl.emit_reward(1.0 if answer.strip() == "5" else 0.0)
