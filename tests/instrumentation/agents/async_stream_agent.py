"""An asyncio agent: AsyncOpenAI, one streamed and one plain call, a sync call from inside the running loop."""

import asyncio

import openai

import spanrl


async def main() -> None:
    client = openai.AsyncOpenAI()
    stream = await client.chat.completions.create(
        model="tiny-calc", messages=[{"role": "user", "content": "stream 2+3"}], stream=True,
        stream_options={"include_usage": True},
    )
    streamed = "".join([chunk.choices[0].delta.content or "" async for chunk in stream if chunk.choices])
    plain = await client.chat.completions.create(model="tiny-calc", messages=[{"role": "user", "content": "plain 2+3"}])
    # A synchronous client called from inside a running event loop (OpenLLMetry's thread-per-call path).
    sync = openai.OpenAI().chat.completions.create(model="tiny-calc",
                                                   messages=[{"role": "user", "content": "sync 2+3"}])
    answers = [streamed, plain.choices[0].message.content, sync.choices[0].message.content]
    print("answers:", answers)
    spanrl.emit_reward(sum(a == "5" for a in answers) / 3)


asyncio.run(main())
