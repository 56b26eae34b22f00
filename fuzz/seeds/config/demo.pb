1
login/auth/login"POST*authB
login (<
auth/auth*auth/
users
/api/users*users2/users8B	
api (<3
orders/api/orders*orders2/orders8B	
api (<q
overview/api/overview8B	
api (<HÐòE

userusers/users/{rest} 
#
ordersorders/orders/{rest}(è"F
auth
auth-1http://127.0.0.1:8779
/healthzˆ'Ð ("N"G
users 
users-1http://127.0.0.1:8380
/healthˆ'Ð ("N"l
orders!
orders-1http://127.0.0.1:8733!
orders-2http://127.0.0.1:8300
/healthˆ'Ð ("N